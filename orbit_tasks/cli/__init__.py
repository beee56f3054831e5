"""The ``orbit`` operator CLI: one module per command group, registered in ``main``."""
