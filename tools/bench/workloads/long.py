"""Long answers (512 tokens): open prose where whatever repeats is the model's own text."""
from workloads import Instance, Workload

ASKS = [
    "Write a long, detailed story about two sisters who open a bakery in a small town.",
    "Write a detailed guide to planning a vegetable garden, from choosing the spot to the harvest.",
    "Write a long essay on how the printing press changed Europe.",
    "Write a long story about a robot that works in a library and wants to read every book.",
    "Explain in detail how a city gets clean drinking water, step by step.",
    "Write a long travel diary of a week spent sailing between islands.",
    "Write a detailed history of a fictional kingdom, from its founding to its fall.",
    "Write a long, detailed explanation of how airplanes fly, for a curious teenager.",
]

WORKLOAD = Workload(
    name="long", kind="open", tokens=512, quick_tokens=128, order=70,
    describe="a long answer in prose, 512 tokens (another request each round)",
    pool=[Instance([a]) for a in ASKS])
