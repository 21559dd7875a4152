"""What the ``register`` step publishes, and the names later steps and the DAG read it by.

Output (published atomically)::

    decision.json       {"registry", "version" ("vN"), "model_uri" (the registry's copy),
                        "source_model_uri", "blessed" (bool), "decision" (the gate's
                        GateDecision: passed, metric, candidate, blessed, blessed_version,
                        max_drop, reason)}
    config.resolved.yaml

The registry itself (the version's record and model copy, the alias) lives under
``registry.uri``, not here: this output is the run's record of what the step did.
"""

from __future__ import annotations

STEP = "register"
DECISION_FILE = "decision.json"
