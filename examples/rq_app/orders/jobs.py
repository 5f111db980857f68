"""The order: reserve the stock, then charge the card, each a job that RQ retries when it failed or
its worker died (``Retry(max=3)``); the charge is enqueued once the reservation finished."""

from rq import Retry

import killpoint
from orders import payments


def reserve_stock(order_id):
    receipt = payments.post("inventory", {"order": order_id, "sku": "SKU-1", "qty": 1})
    killpoint.point("after_call")  # where a crash test may stop the worker (nothing outside one)
    return receipt


def charge_card(order_id):
    receipt = payments.post("payment", {"order": order_id, "amount": 1200, "currency": "EUR"})
    killpoint.point("after_call")
    return receipt


def place_order(queue, order_id):
    """Enqueue one order: ``place_order(Queue("orders", connection=Redis()), "order-42")``."""
    reserved = queue.enqueue(reserve_stock, order_id, retry=Retry(max=3))
    return queue.enqueue(charge_card, order_id, depends_on=reserved, retry=Retry(max=3))
