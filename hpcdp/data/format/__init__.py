"""What a prepared file holds, one module per kind: `samples` (fixed-shape samples),
`tokens` (token streams) and `clicks` (click logs); the names, dtypes, attributes and the
checks a reader relies on. `image_decode` is how one image file becomes the sample an
image dataset holds, by the rules that both the image recipe and `hpcdp predict` apply."""
