"""graft's results beside the paper's: the numbers the paper states (:mod:`.numbers`) and
their tests against a run's saved tables (:mod:`.agreement`)."""
