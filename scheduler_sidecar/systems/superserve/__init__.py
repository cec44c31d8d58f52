"""SuperServe (Khare et al., NSDI '25): SlackFit over a supernet's subnets, and the policies it is compared with
(MaxAcc, MaxBatch, Clipper+, INFaaS); ``optimal`` is the offline bound of its Eq. 1."""

from scheduler_sidecar.systems import System
from scheduler_sidecar.systems.superserve.baselines import ClipperPlus, Infaas
from scheduler_sidecar.systems.superserve.greedy import MaxAcc, MaxBatch
from scheduler_sidecar.systems.superserve.slackfit import SlackFit

SYSTEM = System("superserve", (SlackFit, MaxAcc, MaxBatch, ClipperPlus, Infaas))
