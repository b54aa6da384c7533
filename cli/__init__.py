"""The `dgr` command line: the dispatcher (``cli.main``) and one thin module per subcommand.

The top of the import graph and the only place that wires stages together where one would otherwise
import a later one (certify to the report renderer, provisioning and sealing to the lane build)."""
