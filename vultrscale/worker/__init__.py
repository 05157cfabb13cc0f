"""The reference worker runtime: ``vultrscale worker --app MODULE:FUNC``.

A handler is ``def handle(job) -> None`` (or ``async def``). It gets a ``Job`` with ``id``,
``payload``, ``attempt``, ``step(name, fn)`` (``await job.astep(name, fn)`` in an ``async
def`` handler), ``stopping`` and ``lost``; raising ``PermanentError`` ends the job ``failed``
at once, any other exception (``SystemExit`` included) retries it with backoff until it is
``dead``.
"""

from vultrscale.worker.job import Job, LeaseLost, PermanentError

__all__ = ["Job", "LeaseLost", "PermanentError"]
