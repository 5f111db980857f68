"""A small shop whose orders are Celery tasks, laid out as Celery's "Using Celery in your
Application" lays out a project: the app in ``shop/celery.py``, the tasks in ``shop/tasks.py``."""
