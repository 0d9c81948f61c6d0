"""The spec language (above :mod:`graft.core.families`): the graft spec, its text and JSON
forms and its resolution on a model (:mod:`graft.core.language.spec`), the position and
layer selectors (:mod:`graft.core.language.selectors`), the component vocabulary and the
protocols' resolution rules (:mod:`graft.core.language.vocabulary`), a graft as a Python
object (:mod:`graft.core.language.graft_object`), and the named spans a spec's positions
refer to, located in tokens (:mod:`graft.core.language.spans`)."""
