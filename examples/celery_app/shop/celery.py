"""The shop's Celery app, as Celery's documentation writes one: its broker and result backend, and
the settings for tasks that must survive a worker's death (acknowledged once they return, one
message at a time)."""

import os

from celery import Celery

app = Celery("shop",
             broker=os.environ.get("SHOP_BROKER_URL", "redis://localhost:6379/0"),
             backend=os.environ.get("SHOP_RESULT_BACKEND", "redis://localhost:6379/1"),
             include=["shop.tasks", "shop.tasks_fixed"])

app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={"visibility_timeout": 3600},
)
