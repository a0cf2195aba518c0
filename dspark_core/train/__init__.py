"""Layer 4, training: drafters (eagle, dflash, dspark) and the draft LM, on the data layer's features."""
