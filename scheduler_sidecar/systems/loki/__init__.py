"""Loki (Ahmad, Guan, Sitaraman, HPDC '24): pipelines with data-dependent fan-out, hardware then accuracy scaling,
most-accurate-first routing, early dropping and opportunistic rerouting."""
