"""Reading prepared files: the epoch order (`order`, pure), the readers of fixed-shape
samples (`samples`, `windows`, `epochs`), of several row-aligned fields
(`multi_field`), of token windows (`tokens`), evaluation slices (`evaluation`),
`prefetch`, `augment` and the reader protocol."""
