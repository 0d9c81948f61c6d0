"""The entry points on the engine, the highest room of :mod:`graft.core`: ``graft_texts`` and
``score_targets`` on text prompts (:mod:`graft.core.api.texts`), whole-continuation scoring
(:mod:`graft.core.api.continuation`), ``graft.generate`` (:mod:`graft.core.api.generate`;
its steps on a key/value cache: :mod:`graft.core.api.decoding`),
``graft.trace``, the graft as an nnsight trace (:mod:`graft.core.api.grafted_trace`; its
tracer :mod:`graft.core.api.tracer`; ``g.invoke`` and eager attention:
:mod:`graft.core.api.trace_invokes`), the engine's self-check on a model pair
(:mod:`graft.core.api.selfcheck`), and ``graft.attribute``, every cell's graft effect
estimated from one backward pass (:mod:`graft.core.api.attribution`; its ``local``
estimator's exact attention-block changes: :mod:`graft.core.api.attribution_local`; checked
against real grafts of single cells and of whole layers and position sets:
:mod:`graft.core.api.attribution_verify`)."""
