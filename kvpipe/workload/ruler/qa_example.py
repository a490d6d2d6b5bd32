"""The QA rows workload=ruler asks without a file of the user's (`workload.qa_path`): RULER's qa_1 and
qa_2 read SQuAD and HotpotQA, which are downloads, so kvpipe bundles this small example instead. Its
documents are invented (towns, people and things that do not exist), so no model answers them from
memory and no haystack text can hold their answers: an answer comes from reading its document.
qa_1 rows have one document; qa_2 rows have two, and their question needs both."""

ROWS = (
    {"context": "Velmora is a harbour town on the northern coast of the Isle of Brannock. Its lighthouse, "
                "built in 1874 by the engineer Orla Fenwick, is painted in green and white stripes, and its "
                "keeper rings a bronze bell named Old Tamsin every evening at dusk.",
     "question": "What is the name of the bell rung in Velmora every evening?", "answers": ["Old Tamsin"]},
    {"context": "The Quillon Pass crosses the Sarrow Mountains at a height of 2,340 metres. Traders once "
                "carried salt over it on mules, and the inn at its summit, the Grey Heron, still serves a "
                "barley soup made to a recipe that its first owner, Mads Ilvane, wrote down in 1702.",
     "question": "What is the name of the inn at the summit of the Quillon Pass?", "answers": ["Grey Heron", "the Grey Heron"]},
    {"context": "The Ostrel Orchestra was founded in the city of Dunmere by the cellist Hedda Varro. Its "
                "concerts are held in a former tram depot, and every winter it plays a suite called The "
                "Frozen Canal, written for it by the composer Piet Lanholm.",
     "question": "Who founded the Ostrel Orchestra?", "answers": ["Hedda Varro"]},
    {"context": "Kestrelbrook College keeps a library of maps in a round tower of red brick. The oldest map "
                "in it shows the river Ambery before its course was moved, and it was drawn by a surveyor "
                "called Ines Caldor in the spring of 1611.",
     "question": "Which river is shown on the oldest map of the Kestrelbrook College library?", "answers": ["Ambery", "the river Ambery"]},
    {"context": "In the village of Tollick, the yearly fair is opened by whoever grew the heaviest pumpkin "
                "the autumn before. In the last fair the honour went to a retired postman, Abel Struan, "
                "whose pumpkin weighed 212 kilograms.",
     "question": "How much did Abel Struan's pumpkin weigh?", "answers": ["212 kilograms", "212 kg", "212"]},
    {"context": "The steamship Marigold Drift carried passengers between Port Ellery and the Calder Islands "
                "until 1931. Its captain for most of those years, Ruth Penhallow, kept a parrot on the "
                "bridge that could whistle the first bars of a sea shanty.",
     "question": "Who was the captain of the Marigold Drift for most of its years?", "answers": ["Ruth Penhallow"]},
    {"context": "Brindlewood is known for a cheese ripened in caves under its church. The cheese, called "
                "Saint Odran's Blue, is turned by hand every third day and sold only at the Thursday "
                "market on the town's square.",
     "question": "On which day of the week is Saint Odran's Blue sold?", "answers": ["Thursday"]},
    {"context": "The astronomer Lidia Morvant discovered a faint comet from the observatory on Mount Sable. "
                "She named it Quenby, after the farm where she grew up, and it returns to the inner solar "
                "system every 41 years.",
     "question": "How often does the comet Quenby return to the inner solar system?", "answers": ["every 41 years", "41 years"]},
    {"context": ["Harlow Dace is a painter who lives in the town of Merrowgate and paints only ships.",
                 "Merrowgate stands on the river Sevel, and its bridge was rebuilt in 1958 after a flood."],
     "question": "On which river stands the town where the painter Harlow Dace lives?", "answers": ["Sevel", "the river Sevel"]},
    {"context": ["The clockmaker Tobin Rusk built the great clock of Ashcombe's town hall.",
                 "Tobin Rusk was trained in the workshop of his aunt, Maren Rusk, in the city of Pellingford."],
     "question": "In which city was the builder of Ashcombe's town hall clock trained?", "answers": ["Pellingford"]},
    {"context": ["The novel The Salt Orchard was written by Neve Castellan.",
                 "Neve Castellan was born on the island of Harrowey and taught mathematics there for twenty years."],
     "question": "On which island was the author of The Salt Orchard born?", "answers": ["Harrowey"]},
    {"context": ["The Fenwick Cup is a rowing race won last year by the crew of Alder Hall.",
                 "Alder Hall's boat club trains on Lake Wenlow, near the village of Cray."],
     "question": "On which lake does last year's winner of the Fenwick Cup train?", "answers": ["Lake Wenlow", "Wenlow"]},
)  # fmt: skip
