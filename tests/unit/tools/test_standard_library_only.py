"""The import contract type of tools/lint/standard_library_only.py, on import graphs built by hand."""

from __future__ import annotations

import grimp

from tools.lint.standard_library_only import StandardLibraryOnlyContract


def graph(*imports: tuple[str, str]) -> grimp.ImportGraph:
    built = grimp.ImportGraph()
    for line, (importer, imported) in enumerate(imports, start=1):
        built.add_import(importer=importer, imported=imported, line_number=line, line_contents=f"import {imported}")
    return built


def check(built: grimp.ImportGraph, *modules: str) -> list[tuple[str, str, list[int]]]:
    contract = StandardLibraryOnlyContract(name="stdlib only", session_options={},
                                           contract_options={"modules": list(modules)})
    result = contract.check(built, verbose=False)
    illegal: list[tuple[str, str, list[int]]] = result.metadata["illegal"]
    assert result.kept == (not illegal)
    return illegal


def test_the_standard_library_is_allowed() -> None:
    assert check(graph(("pkg.init", "os"), ("pkg.init", "collections.abc"), ("pkg.init", "__future__")),
                 "pkg.init") == []


def test_third_party_and_project_modules_are_not() -> None:
    built = graph(("pkg.init", "json"), ("pkg.init", "yaml"), ("pkg.init", "pkg.other"), ("pkg.other", "boto3"))
    assert check(built, "pkg.init") == [("pkg.init", "pkg.other", [3]), ("pkg.init", "yaml", [2])]


def test_only_the_named_modules_are_held_to_it() -> None:
    assert check(graph(("pkg.init", "os"), ("pkg.other", "boto3")), "pkg.init") == []
