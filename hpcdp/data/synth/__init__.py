"""Files shaped like those a field's users hold, written for scale trials and benchmarks:
Criteo click logs (`criteo_logs`), photo-sized JPEG folders and tar shards (`photos`), and
JSON Lines corpora of varied document sizes (`corpus`). Preparation never imports them."""
