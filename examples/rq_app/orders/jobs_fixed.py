"""``orders/jobs.py`` with the fix: each request's Idempotency-Key is the order's and the step's, the
same when RQ runs the job again, so a job run again is answered with the first result."""

from rq import Retry

import killpoint
from orders import payments


def reserve_stock(order_id):
    receipt = payments.post("inventory", {"order": order_id, "sku": "SKU-1", "qty": 1}, key=f"{order_id}:reserve")
    killpoint.point("after_call")  # where a crash test may stop the worker (nothing outside one)
    return receipt


def charge_card(order_id):
    receipt = payments.post("payment", {"order": order_id, "amount": 1200, "currency": "EUR"}, key=f"{order_id}:charge")
    killpoint.point("after_call")
    return receipt


def place_order(queue, order_id):
    """Enqueue one order: ``place_order(Queue("orders", connection=Redis()), "order-42")``."""
    reserved = queue.enqueue(reserve_stock, order_id, retry=Retry(max=3))
    return queue.enqueue(charge_card, order_id, depends_on=reserved, retry=Retry(max=3))
