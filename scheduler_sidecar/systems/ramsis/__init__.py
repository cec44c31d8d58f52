"""RAMSIS (Mendoza et al., EuroSys '24): per-worker MDP model-selection policies, generated offline.

- ``model_table``: l(m, b) and Accuracy(m) from a profile or the authors' CSV; Pareto pruning.
- ``mdp``: states, actions, rewards and the transition probabilities of Eqs. 1-3.
- ``solve``: value iteration and the stationary expectations (§5.1).
- ``generate``: one policy per load, the load grid refined to 1-point accuracy gaps.
- ``policy_file``: the ``.npz`` policy format and its online lookup.
- ``baselines``: ModelSwitching's and Jellyfish+'s static choice per load.
- ``load_curve``: the Twitter load curve the paper replays.
- ``online``: the load monitor, the round-robin balancer and the per-load pick.
- ``policy``: the registered online policies ``ramsis``, ``jellyfish`` and ``modelswitching``.

Its reproduction, ``accscale ramsis ...`` and ``accscale bench ramsis`` are in ``experiments/ramsis``.
"""

from scheduler_sidecar.core.profile import PROFILES_DIR
from scheduler_sidecar.systems import System
from scheduler_sidecar.systems.ramsis.policy import JellyfishPlus, ModelSwitching, Ramsis

DATA_DIR = PROFILES_DIR / "ramsis"
LATENCY_CSV = DATA_DIR / "ramsis_cpu_latency.csv"
MODELSWITCHING_CSV = DATA_DIR / "modelswitching_static_choice_image_cpu_slo150ms.csv"
TWITTER_CURVE = DATA_DIR / "twitter_04_25_norm.txt"

SYSTEM = System("ramsis", (Ramsis, JellyfishPlus, ModelSwitching))
