module fibers.local/pause

go 1.25.0
