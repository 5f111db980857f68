"""The order: reserve the stock, then charge the card, each a task that must survive a worker's
death (``acks_late``: acknowledged once it returned, delivered again if its worker died first)."""

from celery import chain

from shop import payments
from shop.celery import app


@app.task(acks_late=True)
def reserve_stock(order_id):
    return payments.post("inventory", {"order": order_id, "sku": "SKU-1", "qty": 1})


@app.task(acks_late=True)
def charge_card(order_id):
    return payments.post("payment", {"order": order_id, "amount": 1200, "currency": "EUR"})


def order_flow(order_id):
    """One order's work: ``order_flow(order_id).delay()`` places it."""
    return chain(reserve_stock.si(order_id), charge_card.si(order_id))
