"""Click logs for the recommendation task: the synthetic log (`synth`), its recipe
(`prep`) and the check of a click file before training (`check`)."""
