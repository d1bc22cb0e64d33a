//! `kube::Resource` for slim view types: a struct with a `metadata:
//! ObjectMeta` field that deserializes only what a controller reads can
//! then be listed and watched like the full type.

/// Implements `kube::Resource` for `$ty` as the API type of that group,
/// version, kind and plural; `$scope` is `k8s_openapi`'s scope type. The
/// crate using it depends on `kube` and `k8s_openapi`.
#[macro_export]
macro_rules! view_resource {
    ($ty:ty, $scope:ty, $group:expr, $version:expr, $kind:expr, $plural:expr) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($kind)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($group)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($version)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($plural)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// `name()`, `namespace()` and `uid()` of a view with `metadata`: empty
/// when unset.
#[macro_export]
macro_rules! view_accessors {
    ($ty:ty) => {
        impl $ty {
            pub fn name(&self) -> &str {
                self.metadata.name.as_deref().unwrap_or_default()
            }
            pub fn namespace(&self) -> &str {
                self.metadata.namespace.as_deref().unwrap_or_default()
            }
            pub fn uid(&self) -> &str {
                self.metadata.uid.as_deref().unwrap_or_default()
            }
        }
    };
}

pub use crate::{view_accessors, view_resource};
