"""Running the plans (above :mod:`graft.core.planning`): the one execution loop
(:mod:`graft.core.execution.engine`) and what it accepts (:mod:`graft.core.execution.inputs`),
how each row runs (:mod:`graft.core.execution.routing`), the executors
(:mod:`graft.core.execution.executor`), the modules they look up by path
(:mod:`graft.core.execution.module_tables`) and where they split a grafted matrix product
(:mod:`graft.core.execution.split`), the code that runs inside an nnsight trace and
travels to a server (:mod:`graft.core.execution.trace`), the local graft without a trace
(:mod:`graft.core.execution.hooked`), the head's logits into kept buffers
(:mod:`graft.core.execution.head`), the layers a step's identical rows run once
(:mod:`graft.core.execution.depth_share`), rows run from their first grafted layer
(:mod:`graft.core.execution.resume`) and column (:mod:`graft.core.execution.windows`) on
each prompt's layer inputs, keys, values and site outputs, computed once
(:mod:`graft.core.execution.prompt_values`)."""
