"""Errors of the Vultr client, rooted in ``RuntimeFailure`` (exit 1) except ``AuthError`` (exit 2).

The type decides what a caller does next: ``NotFound`` is an answer, ``InstanceLocked`` is
"try again on a later pass", ``AmbiguousCreate`` is "look the label up before creating again".
"""

from __future__ import annotations

from vultrscale.errors import EXIT_USAGE, RuntimeFailure, UsageError
from vultrscale.vultr import refusals

AUTH_HINT = (
    "check VULTR_API_KEY; if the key has an IP allow-list, add this machine's address "
    "(my.vultr.com > Account > API)."
)


class VultrError(RuntimeFailure):
    """The Vultr API answered with an error, or could not be reached.

    ``status`` is the HTTP status (None when no response arrived); ``api_message`` the
    ``error`` text of the response body (or the start of a non-JSON body).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        api_message: str = "",
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.api_message = api_message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, status={self.status!r})"


class NotFound(VultrError):
    """404, or a 400 whose message says the id is invalid or not found."""


class AuthError(VultrError):
    """401: the API key was refused."""

    exit_code = EXIT_USAGE
    default_hint = AUTH_HINT


class BadRequest(VultrError):
    """Any other 4xx: the API refused the request; the message comes from the API body."""


class OfferingUnavailable(BadRequest):
    """A create refused because the plan cannot be deployed in the region now: not offered
    there, or its hosts have no capacity left (a stock-out). Another offering may take it."""


class InstanceLimit(BadRequest):
    """A create refused because the account is at its instance limit: no offering takes it
    until instances are deleted or Vultr raises the limit."""

    default_hint = "Ask Vultr to raise the account's instance limit, or lower policy.max_instances."


def create_refusal(message: str) -> type[BadRequest]:
    """The kind of a create Vultr refused (4xx) with ``message``: ``InstanceLimit``,
    ``OfferingUnavailable``, or ``BadRequest`` when the words are none the scaler knows (the
    pass reports them as they are and counts the offering as unavailable)."""
    kind = refusals.refusal(message)
    if kind is refusals.Refusal.INSTANCE_LIMIT:
        return InstanceLimit
    if kind is refusals.Refusal.UNAVAILABLE:
        return OfferingUnavailable
    return BadRequest


class RateLimited(VultrError):
    """429 after the retries were exhausted."""

    default_hint = (
        "Vultr allows 30 requests/s per source address; another client on this address may be "
        "busy. Try again in a minute."
    )


class ServerError(VultrError):
    """5xx after the retries were exhausted."""

    default_hint = "Vultr had a problem; try again later (https://status.vultr.com)."


class InstanceLocked(ServerError):
    """500 "Server is currently locked": the instance is pending or busy; retry on a later pass."""

    default_hint = "The instance is still being provisioned or changed; the next pass retries."


class ApiUnreachable(VultrError):
    """Connect or read errors, or timeouts, after the retries were exhausted."""

    default_hint = "Check the network and VULTR_API_URL (default https://api.vultr.com)."


class AmbiguousCreate(VultrError):
    """A POST that creates (an instance, a snapshot) may or may not have taken effect.

    The response was a 5xx, never came, or could not be read. Never POST again blindly: look
    the resource up by ``label`` (instances) or description (snapshots) first.
    """

    default_hint = "The next pass looks the instance up by its label before creating another."

    def __init__(
        self,
        message: str,
        *,
        label: str | None = None,
        status: int | None = None,
        api_message: str = "",
        hint: str | None = None,
    ) -> None:
        super().__init__(message, status=status, api_message=api_message, hint=hint)
        self.label = label


def unknown_region(region: str) -> UsageError:
    """The error for a fleet.region Vultr does not know (exit 2, before anything is touched)."""
    return UsageError(
        f"fleet.region {region!r} is not a Vultr region",
        hint="Set fleet.region to a region id from https://api.vultr.com/v2/regions "
        "(e.g. ewr, fra, sgp).",
    )
