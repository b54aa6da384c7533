// filled in by the worker implementation
