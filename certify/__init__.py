"""dgr-certify: the certification stage and the `dgr` command line."""
