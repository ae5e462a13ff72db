"""What a prepared file holds, one module per kind: `tokens` (token streams) and
`clicks` (click logs); the names, dtypes, attributes and the checks a reader relies on."""
