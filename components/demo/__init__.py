"""The bundled, deterministic demo graphs: homogeneous (:mod:`.graph`) and heterogeneous
(:mod:`.hetero_graph`)."""
