"""Research routers: controls and oracles that the lab evaluates beside the product's routers."""
