"""The subcommands of ``killpoint``, one module each, imported only when chosen.

What they share is in three modules of their own: :mod:`.options` (the options and what their values
become), :mod:`.summary` (what the runs came to: the verdict, JSON, exit code) and :mod:`.output`
(progress, reports, JUnit XML, the printed verdict)."""
