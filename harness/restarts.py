"""Service restarts: what a fault that fired asks to restart (``RunConfig.restarts``).

The downstream restarts on the same ledger and port, the target's own server through its
``restart()`` hook, and the store by cutting every connection to it. A layer of
:class:`~killpoint.harness.supervise.Supervisor`, a room of its own because each restart reaches
past the workers to a service the run shares.
"""

from __future__ import annotations

from killpoint import vocab
from killpoint.harness.starts import Starts


class Restarts(Starts):
    """Restarting the services a fault names, the moment it fired."""

    def restart_services(self, index: int) -> None:
        """Restart what ``RunConfig.restarts`` names for fault ``index``, the moment it fired.

        The store has no process of its own to restart (SQLite lives inside its clients), so a
        store restart cuts every connection to it the only real way: every live worker is killed
        (its connections, and any transaction it had open, die with it) and replaced, and the
        harness closes and reopens its own handle (SQLite then replays the write-ahead log).
        """
        fault = str(self.schedule.faults[index])
        if self.spare is not None and self.config.restarts.get(fault):
            self.discard(self.spare)  # forked before the restart: it would start on what went away
        for service in self.config.restarts.get(fault, ()):
            if service == "downstream":
                before = self.downstream.pid
                self.downstream.restart()
                self.note(vocab.DOWNSTREAM_RESTART, fault=fault, pid_before=before,
                          pid=self.downstream.pid, address=self.downstream.address)
                continue
            if service == "target":
                # The target's own server (its restart() hook), e.g. a Restate server killed and
                # started again on the same data.
                ok = self.restart_target() if self.restart_target is not None else False
                self.note(vocab.TARGET_RESTART, fault=fault, ok=ok)
                continue
            killed = self.live()
            for w in killed:
                self.kill_worker(w, "store restart: every connection to the store is cut")
            self.store.close()
            self.store.snapshot()  # a new connection, on what the killed writers left
            self.note(vocab.STORE_RESTART, fault=fault, killed=[w.label for w in killed])
            for w in killed:
                if len(self.workers) < self.spawn_cap:
                    self.replace(w)
