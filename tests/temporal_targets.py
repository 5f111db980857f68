"""Activity targets whose replay check runs against a changed workflow (``test_temporal.py``), named
on the command line as ``temporal_targets:reordered_keyed``, as a user names their own."""

from killpoint.harness.servers import temporal_orders
from killpoint.harness.servers.temporal import activity_target

unchanged_keyed = activity_target("keyed", workflow=temporal_orders.OrderWorkflow)
reordered_keyed = activity_target("keyed", workflow=temporal_orders.ReorderedOrderWorkflow)
