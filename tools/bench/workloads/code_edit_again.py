"""The same code edit asked again every round (an agent that sends the same request):
the n-gram memory replays the previous answer. A labelled row, never the headline."""
from workloads import Workload
from workloads.code_edit import WORKLOAD as CODE_EDIT

WORKLOAD = Workload(
    name="code-edit-again", kind="replayed", tokens=CODE_EDIT.tokens, quick_tokens=CODE_EDIT.quick_tokens,
    order=90, describe="the first round's code edit, asked again every round (replayed)",
    pool=CODE_EDIT.pool[:1])
