//! `audit`: reads the claims and pods of the namespace (or every one) and
//! prints what looks wrong.

use k8s_openapi::jiff::Timestamp;

use super::{AuditArgs, audit_namespace, connect, emit, within};
use crate::audit::audit;
use crate::read::{ReadError, Reader};
use crate::report::{AuditScope, exit};

/// Runs `audit`; its exit code.
pub(super) async fn run(args: AuditArgs) -> u8 {
    let client = match connect(&args.connection).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let context_namespace = client.default_namespace().to_string();
    let reader = Reader::new(client);
    let namespace = audit_namespace(&args, &context_namespace);
    let read = reader.for_audit(namespace.as_deref(), args.node.as_deref());
    let read = match within(&args.connection.request_timeout, read).await {
        Ok(read) => read,
        Err(late) => {
            eprintln!("error: the check could not be completed: {late}");
            return exit::INCOMPLETE;
        }
    };
    let snapshot = match read {
        Ok(s) => s,
        Err(e) => return incomplete(&e),
    };
    let scope = AuditScope {
        node: args.node.clone(),
        namespace,
    };
    let report = audit(&snapshot, scope, Timestamp::now());
    emit(&report, args.output);
    report.exit_code()
}

fn incomplete(err: &ReadError) -> u8 {
    eprintln!("error: the check could not be completed: {err}");
    exit::INCOMPLETE
}
