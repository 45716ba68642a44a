// Command gopodcontroller is the Go anchor of `python -m scripts.bench podcontroller`: a
// minimal pod controller on client-go doing the Python pod controller's I/O per Pod, so its CPU
// and memory on the same kube-apiserver show what the Go stack spends on the same work
// (docs/benchmarks/podcontroller-real.md).
//
// Per Pod: a shared informer on Pods (all namespaces; protobuf, as kube-controller-manager asks
// for built-in kinds), one on CapacityRequests labelled bigfleet.lucy.sh/owned-by-pod (JSON:
// CRDs have no protobuf), and a rate-limited workqueue drained by -workers goroutines. A
// worker creates the Pod's owner-referenced CapacityRequest named "cr-<uid>" (AlreadyExists:
// it is there) and merge-patches its status subresource to phase Pending, unless the CR cache
// already shows it Pending. The translation is crude on purpose (summed container requests,
// spec.priority, nodeSelector as In requirements): the I/O is what the bench compares.
//
// It prints {"event": "synced", "pods": N} on stdout once both caches synced, and runs until
// SIGTERM or SIGINT.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sort"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

const (
	ownedByPodLabel = "bigfleet.lucy.sh/owned-by-pod"
	protobuf        = "application/vnd.kubernetes.protobuf"
)

var crGVR = schema.GroupVersionResource{
	Group: "bigfleet.lucy.sh", Version: "v1alpha1", Resource: "capacityrequests"}

type controller struct {
	pods    corelisters.PodLister
	crs     cache.GenericLister
	dyn     dynamic.Interface
	queue   workqueue.TypedRateLimitingInterface[string]
	pending []byte
}

// buildCR is the crude translation: the summed container requests, spec.priority and each
// nodeSelector entry as an In requirement.
func buildCR(pod *corev1.Pod) *unstructured.Unstructured {
	sums := corev1.ResourceList{}
	for _, c := range pod.Spec.Containers {
		for name, q := range c.Resources.Requests {
			sum := sums[name]
			sum.Add(q)
			sums[name] = sum
		}
	}
	resources := map[string]any{}
	for name, q := range sums {
		resources[string(name)] = q.String()
	}
	keys := make([]string, 0, len(pod.Spec.NodeSelector))
	for k := range pod.Spec.NodeSelector {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	requirements := make([]any, 0, len(keys))
	for _, k := range keys {
		requirements = append(requirements, map[string]any{
			"key": k, "operator": "In", "values": []any{pod.Spec.NodeSelector[k]}})
	}
	var priority int64
	if pod.Spec.Priority != nil {
		priority = int64(*pod.Spec.Priority)
	}
	spec := map[string]any{"priority": priority, "resources": resources}
	if len(requirements) > 0 {
		spec["requirements"] = requirements
	}
	uid := string(pod.UID)
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "bigfleet.lucy.sh/v1alpha1",
		"kind":       "CapacityRequest",
		"metadata": map[string]any{
			"name":      "cr-" + uid,
			"namespace": pod.Namespace,
			"labels":    map[string]any{ownedByPodLabel: uid},
			"ownerReferences": []any{map[string]any{
				"apiVersion": "v1", "kind": "Pod", "name": pod.Name, "uid": uid,
				"controller": true}},
		},
		"spec": spec,
	}}
}

func (c *controller) reconcile(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := c.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil // the garbage collector removes its CR
	} else if err != nil {
		return err
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	crName := "cr-" + string(pod.UID)
	crs := c.dyn.Resource(crGVR).Namespace(ns)
	if obj, err := c.crs.ByNamespace(ns).Get(crName); err == nil {
		phase, _, _ := unstructured.NestedString(obj.(*unstructured.Unstructured).Object,
			"status", "phase")
		if phase != "" {
			return nil
		}
	} else {
		_, err := crs.Create(ctx, buildCR(pod), metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	_, err = crs.Patch(ctx, crName, types.MergePatchType, c.pending, metav1.PatchOptions{},
		"status")
	return err
}

func (c *controller) work(ctx context.Context) {
	for {
		key, quit := c.queue.Get()
		if quit {
			return
		}
		if err := c.reconcile(ctx, key); err != nil {
			log.Printf("reconcile %s: %v", key, err)
			c.queue.AddRateLimited(key)
		} else {
			c.queue.Forget(key)
		}
		c.queue.Done(key)
	}
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (required)")
	workers := flag.Int("workers", 16, "reconcile goroutines")
	qps := flag.Float64("qps", -1, "client-side rate limit in requests/s (<= 0: none)")
	flag.Parse()
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "gopodcontroller: -kubeconfig is required")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("kubeconfig: %v", err)
	}
	cfg.QPS, cfg.Burst = float32(*qps), 1
	if *qps <= 0 {
		cfg.QPS = -1 // client-go: a negative QPS builds no rate limiter
	}
	typed := *cfg
	typed.ContentType = protobuf
	typed.AcceptContentTypes = protobuf + ",application/json"
	cs, err := kubernetes.NewForConfig(&typed)
	if err != nil {
		log.Fatalf("clientset: %v", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		log.Fatalf("dynamic client: %v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	podFactory := informers.NewSharedInformerFactory(cs, 0)
	podInf := podFactory.Core().V1().Pods()
	crFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(
		dyn, 0, metav1.NamespaceAll, func(o *metav1.ListOptions) { o.LabelSelector = ownedByPodLabel })
	crInf := crFactory.ForResource(crGVR)
	pending, _ := json.Marshal(map[string]any{"status": map[string]any{"phase": "Pending"}})
	c := &controller{
		pods: podInf.Lister(), crs: crInf.Lister(), dyn: dyn, pending: pending,
		queue: workqueue.NewTypedRateLimitingQueue(
			workqueue.DefaultTypedControllerRateLimiter[string]()),
	}
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue,
	}); err != nil {
		log.Fatalf("pod handler: %v", err)
	}
	// a CR that changes or goes brings its owner Pod back (level-triggered)
	owner := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		for _, ref := range u.GetOwnerReferences() {
			if ref.Kind == "Pod" {
				c.queue.Add(u.GetNamespace() + "/" + ref.Name)
			}
		}
	}
	if _, err := crInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, n any) { owner(n) }, DeleteFunc: owner,
	}); err != nil {
		log.Fatalf("cr handler: %v", err)
	}
	podFactory.Start(ctx.Done())
	crFactory.Start(ctx.Done())
	for _, ok := range podFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			log.Fatal("pod cache did not sync")
		}
	}
	for _, ok := range crFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			log.Fatal("capacityrequest cache did not sync")
		}
	}
	pods, _ := c.pods.List(labels.Everything())
	line, _ := json.Marshal(map[string]any{"event": "synced", "pods": len(pods)})
	fmt.Println(string(line))
	for i := 0; i < *workers; i++ {
		go c.work(ctx)
	}
	<-ctx.Done()
	c.queue.ShutDown()
	podFactory.Shutdown()
	crFactory.Shutdown()
}
