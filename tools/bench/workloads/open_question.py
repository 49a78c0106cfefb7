"""An open question answered in prose: nothing in the prompt to copy."""
from workloads import Instance, Workload

QUESTIONS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Why do leaves change colour in autumn?",
    "Describe a busy market on a Saturday morning.",
    "What makes a good teacher? Give a few reasons.",
    "Explain how a bicycle stays upright while it is moving.",
    "Write a letter to a friend about a trip to the mountains.",
    "What are the advantages and disadvantages of working from home?",
    "Tell the story of a cat who learns to swim.",
]

WORKLOAD = Workload(
    name="open-question", kind="open", tokens=192, quick_tokens=64, order=40,
    describe="an open question answered in prose (another question each round)",
    pool=[Instance([q]) for q in QUESTIONS])
