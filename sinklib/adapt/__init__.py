"""Chapter 4: adapted pairs, the contract with chapters 5, 6 and 8 (`pairs`), and the controls that isolate
one thing each: the format-preserving decomposition and random sizes (`isolate`), the dose-response (`dose`),
extra training seeds (`seeds`), the stage-2 learning-rate sweep (`sweep`)."""
