from certify.cli import entry

entry()
