"""An import-linter contract type (pyproject.toml, [tool.importlinter] contract_types):
modules that import nothing but Python's standard library.

import-linter's own types forbid listed modules; this one allows a list instead, so that a
new dependency cannot slip in unnamed. For modules that run where nothing else may be
importable (localcluster.container_init runs under `python -S`), or that both sides of a
boundary import (spark_app.contract: the driver's image and the operator's).

    [[tool.importlinter.contracts]]
    type = "standard_library_only"
    modules = ["localcluster.container_init"]
"""

from __future__ import annotations

import sys
from typing import cast

import grimp
from importlinter import Contract, ContractCheck, fields, output
from importlinter.domain.imports import Module


class StandardLibraryOnlyContract(Contract):
    type_name = "standard_library_only"

    modules = fields.ListField(subfield=fields.ModuleField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        illegal: list[tuple[str, str, list[int]]] = []
        # import-linter sets each field to its parsed value when it reads the contract.
        for module in cast(list[Module], self.modules):
            for imported in sorted(graph.find_modules_directly_imported_by(module.name)):
                if imported.split(".")[0] not in sys.stdlib_module_names:
                    details = graph.get_import_details(importer=module.name, imported=imported)
                    illegal.append((module.name, imported, [d["line_number"] for d in details]))
        return ContractCheck(kept=not illegal, metadata={"illegal": illegal})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, lines in check.metadata["illegal"]:
            output.print_error(f"{importer} -> {imported} (l.{', '.join(map(str, lines))}): "
                               "not the standard library", bold=False)
            output.new_line()
