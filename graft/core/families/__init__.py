"""The model families graft supports, the lowest room of :mod:`graft.core`: one table per
family of the modules the engine may graft, in forward order, with fused q/k/v layouts and
base/donor compatibility (:mod:`graft.core.families.arch`); which nnsight wrapper a model is
traced with and the module inside one (:mod:`graft.core.families.wrapping`)."""
