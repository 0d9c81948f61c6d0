"""Planning, before any model runs (above :mod:`graft.core.language`): rows resolved and
padded into batch plans (:mod:`graft.core.planning.plan`) with their per-site masks
(:mod:`graft.core.planning.masks`), the layouts kept across engine calls
(:mod:`graft.core.planning.plan_cache`), the steps on shared prefixes (:mod:`graft.core.planning.prefix`) and
the key/value cache they continue (:mod:`graft.core.planning.kv_cache`), and which model carries a row
(:mod:`graft.core.planning.carrier`)."""
