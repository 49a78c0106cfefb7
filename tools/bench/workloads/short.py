"""Short answers (32 tokens): where drafting's warm-up and the policy's first steps must cost nothing."""
from workloads import Instance, Workload

QUESTIONS = [
    "In one sentence, what is a prime number?",
    "Name three colours of the rainbow.",
    "What is the capital of Italy? Answer briefly.",
    "In one sentence, why is the sea salty?",
    "Give a synonym for the word happy.",
    "In one sentence, what does a thermometer measure?",
    "What is two plus five? Answer in one sentence.",
    "In one sentence, what is photosynthesis?",
]

WORKLOAD = Workload(
    name="short", kind="open", tokens=32, quick_tokens=32, order=5,
    describe="a short question, 32-token answer (another question each round)",
    pool=[Instance([q]) for q in QUESTIONS])
