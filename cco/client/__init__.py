"""The endpoint client library: join a group, then run verified collectives.

Two faces over one endpoint session (:class:`~cco.nodes.endpoint.EndpointMachine`):

* :class:`Communicator`, for asyncio code: ``await comm.all_reduce(x)``, or
  ``handle = comm.start_all_reduce(x)`` and ``await handle`` later;
* :class:`BlockingCommunicator`, for plain code: the same calls, run on a private
  event loop thread; ``start_*`` return a :class:`concurrent.futures.Future`.

:class:`StripedCommunicator` (:mod:`~cco.client.striped`) cuts each large call of one
job over several groups (stripes), and so over several aggregators' cores;
:class:`BlockingCommunicator` runs over it too, given one transport per stripe.

Every result has passed verification (range, contributor bitmap and homomorphic
tag, or the hop-by-hop checks for MIN/MAX/bitwise ops) before it is returned.  Every
failure is an :class:`~cco.wire.errors.CcoError`; failures of a collective are
:class:`~cco.nodes.calls.OperationError`, which names the group, the operation and
the missing ranks when they are known.  Collectives must be called in the same order
on every rank, as with torch.distributed.

This package is where the API is imported from; its parts live in
:mod:`~cco.client.communicator` (the asyncio face), :mod:`~cco.client.blocking`
(the blocking face), :mod:`~cco.client.spec` (which group to join, and how) and
:mod:`~cco.client.arrays` (what a call takes and gives back).
"""

from cco.client.arrays import NonFinite, NonFiniteError, PartialResult, reduce_op
from cco.client.blocking import BlockingCommunicator
from cco.client.communicator import OFF_LOOP_ELEMENTS, Communicator
from cco.client.spec import FallbackAggregator, GroupSpec, default_rank
from cco.client.striped import MIN_STRIPE_ELEMENTS, StripedCommunicator

__all__ = [
    "MIN_STRIPE_ELEMENTS",
    "OFF_LOOP_ELEMENTS",
    "BlockingCommunicator",
    "Communicator",
    "FallbackAggregator",
    "GroupSpec",
    "NonFinite",
    "NonFiniteError",
    "PartialResult",
    "StripedCommunicator",
    "default_rank",
    "reduce_op",
]
