#!/usr/bin/env python3
"""Lint and render a Helm chart with the helm-python-sdk (Helm's Go SDK).

Used by the harness module crates/e2e/src/helm.rs. Equivalent to

    helm lint --strict --namespace NS [--set ...] CHART
    helm template NAME CHART --namespace NS [--set ...]

Rendered manifests go to stdout as one multi-document YAML stream in the
form `helm template` prints (a `# Source:` comment per template, NOTES.txt
and partials left out), or with --notes the rendered NOTES.txt alone. Lint findings and errors go to stderr.

Exit status: 0 rendered; 1 lint or render failed (schema violations
included); 2 bad usage; 3 the helm-python-sdk cannot be imported.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

SEVERITY = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge override into base the way repeated --set flags accumulate."""
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_merge(base[key], value)
        else:
            base[key] = value
    return base


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chart", help="chart directory")
    parser.add_argument("--name", default="release", help="release name")
    parser.add_argument("--namespace", default="default", help="release namespace")
    parser.add_argument(
        "--set", action="append", default=[], metavar="K=V", help="helm --set expression"
    )
    parser.add_argument(
        "--set-string", action="append", default=[], metavar="K=V", help="helm --set-string"
    )
    parser.add_argument(
        "--values", "-f", action="append", default=[], metavar="FILE", help="values YAML file"
    )
    parser.add_argument(
        "--kube-version", default=None, help="Kubernetes version the chart sees (helm --kube-version)"
    )
    parser.add_argument(
        "--api-versions",
        action="append",
        default=[],
        metavar="G/V[/KIND]",
        help="API versions the chart sees besides Helm's defaults (helm --api-versions)",
    )
    parser.add_argument("--no-lint", action="store_true", help="render only")
    parser.add_argument(
        "--notes", action="store_true", help="print the rendered NOTES.txt instead of manifests"
    )
    args = parser.parse_args()

    try:
        import helm_python as helm
    except Exception as exc:  # ImportError, or the shared library failing to load
        print(f"helm-python-sdk unavailable: {exc}", file=sys.stderr)
        return 3

    try:
        values: dict[str, Any] = {}
        for path in args.values:
            with open(path, encoding="utf-8") as fh:
                deep_merge(values, helm.values_from_yaml(fh.read()))
        for expr in args.set:
            deep_merge(values, helm.parse_set_string(expr))
        for expr in args.set_string:
            deep_merge(values, helm.parse_set_string_values(expr))
    except helm.HelmError as exc:
        print(f"Error: invalid values: {exc}", file=sys.stderr)
        return 2

    if not args.no_lint:
        report = helm.lint(
            args.chart,
            values,
            strict=True,
            namespace=args.namespace,
            kube_version=args.kube_version,
        )
        for msg in report.get("messages", []):
            severity = SEVERITY.get(msg.get("severity", 0), "UNKNOWN")
            print(f"[{severity}] {msg.get('path')}: {msg.get('error')}", file=sys.stderr)
        # --strict: warnings fail as errors do.
        failing = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
        if report.get("errors") or failing:
            print("Error: helm lint failed", file=sys.stderr)
            return 1

    try:
        with helm.Chart.load(args.chart) as chart:
            if args.kube_version or args.api_versions:
                # Chart.render() has no capability options; the native call
                # behind it takes helm template's (validating values as well).
                import json

                from helm_python import _native

                opts = {"name": args.name, "namespace": args.namespace, "is_install": True}
                if args.kube_version:
                    opts["kube_version"] = args.kube_version
                if args.api_versions:
                    opts["api_versions"] = args.api_versions
                manifests = json.loads(
                    _native.call_string(
                        "helm_render", chart._raw(), json.dumps(values), json.dumps(opts)
                    )
                )
            else:
                # render() validates the values against values.schema.json.
                manifests = chart.render(
                    values, name=args.name, namespace=args.namespace, is_install=True
                )
    except helm.HelmError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1

    out = []
    notes = None
    for path in sorted(manifests):
        body = manifests[path]
        base = path.rsplit("/", 1)[-1]
        if base == "NOTES.txt":
            notes = body
            continue
        if base.startswith("_") or not body.strip():
            continue
        out.append(f"---\n# Source: {path}\n{body.strip()}\n")
    if args.notes:
        sys.stdout.write(notes or "")
    else:
        sys.stdout.write("".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
