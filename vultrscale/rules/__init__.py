"""The rules that decide a pass: the fleet's size (``policy``, with ``waits`` and
``offerings``), the budget, an instance's lifecycle and drain verdicts, and the pass's one
decision (``decision``) from its ``readings``. Pure: no I/O, ``now`` is an argument."""
