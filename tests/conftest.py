import os

from hypothesis import HealthCheck, settings

# "dev" explores more; "ci" (the default) keeps the suite well inside CI's budget on two cores.
settings.register_profile(
    "ci", max_examples=40, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=300, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
