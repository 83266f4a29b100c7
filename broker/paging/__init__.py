"""Model paging (--model-control-mode=paged): models loaded on their first request and paged out,
least recently used first, to keep their workers within a host memory budget."""
