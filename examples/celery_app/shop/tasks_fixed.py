"""``shop/tasks.py`` with the fix: each request's Idempotency-Key is the order's and the step's, the
same on every delivery of the task, so a task delivered again is answered with the first result."""

from celery import chain

from shop import payments
from shop.celery import app


@app.task(acks_late=True)
def reserve_stock(order_id):
    return payments.post("inventory", {"order": order_id, "sku": "SKU-1", "qty": 1}, key=f"{order_id}:reserve")


@app.task(acks_late=True)
def charge_card(order_id):
    return payments.post("payment", {"order": order_id, "amount": 1200, "currency": "EUR"}, key=f"{order_id}:charge")


def order_flow(order_id):
    """One order's work: ``order_flow(order_id).delay()`` places it."""
    return chain(reserve_stock.si(order_id), charge_card.si(order_id))
