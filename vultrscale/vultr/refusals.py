"""Vultr's own words for a refused create, in one place: the simulator answers with them and
the scaler's classifier reads them, so the two cannot drift apart.

Sources (API-NOTES.md "Added 2026-12-01"; no v2 wording was found for either refusal):

- ``SOLD_OUT``: the v1 API's answer when a plan cannot be deployed in a region, for either
  reason (the plan is not sold there, or its host nodes are full), caught verbatim by public
  programs that then retry in the next region; the two spaces after the first sentence are
  Vultr's. Vultr's support says a full host node refuses large instances "regardless of how
  the deployment is attempted (... Vultr API ...)" (vultr/whmcs-vultr#74).
- ``INVALID_PLAN``: v2's 400 for a plan the endpoint does not take
  (vultr/terraform-provider-vultr#377).
- ``INSTANCE_LIMIT``: the account's cap on instances, as a create failed with it (v1, quoted in
  getlantern/lantern_aws#186).
- Create errors of v2 begin ``Server add failed:`` (API-NOTES.md §9.7).

The wording may change without notice: classify with :func:`refusal`, which matches the
telling phrases, never the whole text.
"""

from __future__ import annotations

import enum
import re

CREATE_FAILED = "Server add failed: "
SOLD_OUT = (
    "Plan is not available in the selected datacenter.  This could mean you have chosen the "
    "wrong plan (for example, a storage plan in a location that does not offer them), or the "
    "location you have selected does not have any more capacity."
)
INVALID_PLAN = "Invalid plan chosen."
INSTANCE_LIMIT = (
    "You have reached the maximum number of active virtual machines for this account. For "
    "security reasons, please contact our support team to have the limit raised"
)


class Refusal(enum.Enum):
    """Why Vultr refused a create, as far as its words tell."""

    UNAVAILABLE = "unavailable"  # this plan in this region: sold out, or not sold there
    INSTANCE_LIMIT = "instance limit"  # the account's cap: no offering can be created


# The telling phrases: Vultr's words above, and the usual cloud wordings for capacity and
# account limits (v2's own wording for a sold-out plan is not published).
_LIMIT = re.compile(
    r"maximum number of (active )?(virtual machines|instances|servers|vms)"
    r"|(instance|server|vm)s? (count )?limit"
    r"|limit of \d+ (instances|servers|virtual machines)"
    r"|quota",
    re.IGNORECASE,
)
_UNAVAILABLE = re.compile(
    r"not available|unavailable|no (more )?capacity|any more capacity|out of (stock|capacity)"
    r"|sold.?out|insufficient capacity|invalid plan",
    re.IGNORECASE,
)


def refusal(api_message: str) -> Refusal | None:
    """What a refused create's ``error`` text says: the account's limit, an offering that is
    unavailable, or None for words not recognised (the caller shows them as Vultr wrote them)."""
    if _LIMIT.search(api_message):
        return Refusal.INSTANCE_LIMIT
    if _UNAVAILABLE.search(api_message):
        return Refusal.UNAVAILABLE
    return None
