package controllers

// Discovery reads TenantQuotas from the manager's cache.
// +kubebuilder:rbac:groups=crawl.example.com,resources=tenantquotas,verbs=get;list;watch
