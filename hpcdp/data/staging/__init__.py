"""Node-local data staging: where the copy goes (`plan`, pure), copying and recording it
(`copy`), and the collective step every rank takes before its readers open (`collective`)."""
