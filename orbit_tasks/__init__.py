"""orbit-tasks: the Celery worker fleet of the Orbit task platform."""

__version__ = "0.1.0"
