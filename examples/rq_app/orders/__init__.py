"""A small shop whose orders are RQ jobs: the jobs in ``orders/jobs.py``, enqueued by
``place_order``, as RQ's documentation writes jobs (plain functions) and enqueues them."""
