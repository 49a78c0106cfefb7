"""Quote a passage, then summarise it: another passage each round."""
from workloads import Instance, Workload

ASK = ("Here is a passage:\n\n{passage}\n\nQuote the first two sentences of the passage exactly, "
       "then summarize the passage in one sentence.")

PASSAGES = [
    "The lighthouse stood at the edge of the cliff for more than a hundred years. Every night its keeper "
    "climbed the spiral stairs to light the lamp. Ships passing in the storm relied on its beam to find the "
    "harbour. When the keeper grew old, the town installed an electric light, but the people still called "
    "the tower by his name.",
    "The old mill by the river ground flour for the whole valley. Farmers brought their grain on carts every "
    "autumn, and the miller kept a ledger of every sack. When the railway came, the mill fell silent. The "
    "ledger survived in the town library, where children still read the names of their great-grandparents.",
    "Honeybees tell each other where food is by dancing. A forager that has found flowers walks a figure "
    "eight on the comb, and the angle of its run points to the sun. The longer it waggles, the farther away "
    "the flowers are. Other bees follow the dance with their antennae and then fly straight to the spot.",
    "In 1858 a telegraph cable was laid across the floor of the Atlantic Ocean. The first message took "
    "sixteen hours to send, and the cable failed after three weeks. Engineers learned from the failure and "
    "built thicker, better insulated cables. By 1866 messages crossed the ocean in minutes, and the cable "
    "kept working for years.",
    "The night train left the capital at ten and reached the mountains by dawn. Passengers slept in narrow "
    "bunks while the carriages climbed through tunnels and over iron bridges. At the border the guards "
    "checked every passport by torchlight. Most travellers never saw the valleys they crossed in the dark.",
    "A sourdough starter is a living mixture of flour, water, wild yeast and bacteria. Bakers feed it every "
    "day and keep a little of each batch for the next one. Some starters have been kept alive for more than "
    "a century. The bacteria give the bread its sour taste, and the yeast makes it rise.",
    "The village library opened only on Saturday mornings. Its single room held four thousand books, a "
    "stove and a long oak table. The librarian, a retired teacher, knew which book every child would like "
    "before they asked. When she retired, the villagers took turns keeping the doors open.",
    "Glaciers move slowly, a few centimetres to a few metres a day. As they slide, they scrape the rock "
    "beneath them and carry stones for hundreds of kilometres. When the climate warms, they retreat and "
    "leave long ridges of gravel behind. Geologists read these ridges to learn where the ice once reached.",
]

WORKLOAD = Workload(
    name="quote", kind="input", tokens=192, quick_tokens=64, order=20,
    describe="quote the first two sentences of a passage, then summarise it (another passage each round)",
    pool=[Instance([ASK.format(passage=p)]) for p in PASSAGES])
