from device.cli import entry

entry()
