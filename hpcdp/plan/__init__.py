"""`hpcdp plan`: how many nodes? Step time against node count, predicted from one node's
measurement and a network model (model: pure; network: fitted or from a site profile)."""
