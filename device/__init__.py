"""A GPU session in one command: the offline bundle made here and the steps the device script runs."""
