"""The placement loop of an exchange: driving its policy (``routing.placement``) through the
waits it yields.

The policy generator is driven here rather than by ``Deferred.fromCoroutine``: most
requests commit on their first attempt, and a coroutine costs several Deferred and frame
hops per step.  The loop is a trampoline: a wait that is already over when it is yielded
continues the loop instead of nesting a call.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Final

from twisted.internet import defer
from twisted.python.failure import Failure

from nvpair.proxy.dispatch.interfaces import IPolicyOwner
from nvpair.proxy.placement.interfaces import IOutcome, IPlacementExchange
from nvpair.proxy.placement.policies import Policy


class Early(Enum):
    """The result of a wait that ended within the ``addCallbacks`` that started it."""

    WAITING = "waiting"  # none yet: the wait is still on


WAITING: Final = Early.WAITING


class PolicyDriver:
    """The placement loop of one exchange: its policy (made over the exchange, as the
    policy's ``IPlacementExchange``) and what it waits for now (``loop``), ``stepping`` while
    a wait is being started and ``early``, ``WAITING`` or the result of a wait that ended
    within its start.  The exchange has one (``Exchange.driver``) and hears of the loop's
    end through ``IPolicyOwner``: ``placed`` when the policy returns, ``interrupted`` when it
    raises or a wait fails or is cancelled."""

    __slots__ = ("owner", "policy", "loop", "stepping", "early")

    def __init__(self, owner: IPolicyOwner) -> None:
        self.owner = owner
        self.policy: Policy | None = None
        self.loop: defer.Deferred[IOutcome] | defer.Deferred[None] | None = None
        self.stepping = False
        self.early: IOutcome | Failure | Early | None = WAITING

    def start(self, place: Callable[[IPlacementExchange], Policy]) -> None:
        """Make the owner's policy with ``place`` and run it up to its first unfinished wait."""
        self.policy = place(self.owner)
        self._advance(None)

    def cancel(self) -> bool:
        """Cancel the wait in progress; False when there is none (the loop is over)."""
        loop = self.loop
        if loop is not None and not loop.called:
            loop.cancel()
            return True
        return False

    def _advance(self, result: IOutcome | None) -> None:
        """Send ``result`` to the policy and run it up to its next unfinished wait."""
        policy = self.policy
        assert policy is not None
        while True:
            try:
                waiting = policy.send(result)
            except StopIteration:
                self.policy = None
                self.owner.placed()
                return
            except Exception as e:
                self.policy = None
                self.owner.interrupted(e)
                return
            self.loop = waiting
            if self.owner.halted:
                waiting.cancel()  # cancelled while the policy ran between two waits
            self.early = WAITING
            self.stepping = True
            waiting.addCallbacks(self._resumed, self._interrupted)
            self.stepping = False
            early, self.early = self.early, WAITING
            if early is WAITING:
                return  # the wait is still on: ``_resumed`` continues
            if isinstance(early, Failure):
                self._interrupted(early)
                return
            result = early

    def _resumed(self, result: IOutcome | None) -> None:
        if self.stepping:
            self.early = result  # finished inside ``addCallbacks``: the loop goes on
            return
        if self.policy is not None:
            self._advance(result)

    def _interrupted(self, failure: Failure) -> None:
        """The wait failed: cancelled (client gone, shutdown) or a crash in the attempt."""
        if self.stepping:
            self.early = failure
            return
        policy, self.policy = self.policy, None
        if policy is None:
            return
        policy.close()
        error = None
        if not failure.check(defer.CancelledError):
            error = failure.value
            assert error is not None  # a Failure holds its exception
        self.owner.interrupted(error)
